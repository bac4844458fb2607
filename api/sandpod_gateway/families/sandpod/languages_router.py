"""/v1/languages: what executions can be written in."""

from fastapi import APIRouter

from sandpod_gateway.schemas import LanguageList
from sandpod_gateway.web.dependencies import CatalogDep, CurrentTenant
from sandpod_gateway.web.errors import error_responses

router = APIRouter(
    prefix="/v1/languages", tags=["languages"], responses=error_responses(401, 429, 503)
)


@router.get("", response_model=LanguageList, summary="List languages")
async def list_languages(tenant: CurrentTenant, catalog: CatalogDep) -> LanguageList:
    return LanguageList(languages=catalog.all())
